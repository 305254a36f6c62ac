"""Shared fixtures. Heavy modules are imported inside fixtures so unit tests stay fast."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from icesink.app.embedded import EmbeddedBroker
    from tests.support.kafka_broker import KafkaBroker
    from tests.support.schema_registry import SchemaRegistry
    from tests.support.spark_reader import SparkReader


@pytest.fixture(scope="session", autouse=True)
def iceberg_extensions() -> None:
    """The test process commits as a replica does: with icesink's pyiceberg extensions installed
    (coordinator/iceberg_ext/; the CLI's composition root installs them in every replica)."""
    from coordinator import iceberg_ext

    iceberg_ext.install()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One in-memory Tansu broker for the whole session; use a fresh topic name per test."""
    from icesink.app.embedded import EmbeddedBroker

    embedded = EmbeddedBroker(tmp_path_factory.mktemp("broker"))
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One real Apache Kafka broker (KRaft, one node; tests/support/kafka_broker.py) for the whole
    session, started on first use (a few seconds); use a fresh topic and group per test."""
    from tests.support.kafka_broker import KafkaBroker

    started = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistry]:
    """One real schema registry (AxonOps, Confluent's REST API, basic auth on;
    tests/support/schema_registry.py) for the whole session; use a fresh subject per test."""
    from tests.support.schema_registry import SchemaRegistry

    server = SchemaRegistry(tmp_path_factory.mktemp("schema-registry"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark_reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkReader]:
    """Spark 4.1 with the Iceberg Spark runtime in a process of its own (tests/support/spark_reader.py),
    separate from the workers' Spark: one for the whole session, started and warmed up in the background when
    a test first asks for it (its first read waits, and fails loudly if it could not start). Read a
    catalog's tables with ``spark_reader.catalog(name, props).table(...)``."""
    from tests.support.spark_reader import SparkReader

    reader = SparkReader(tmp_path_factory.mktemp("spark-reader"))
    reader.start_in_background()  # while the first test runs its pipeline; its first read waits
    try:
        yield reader
        reader.wait_started()  # a reader that could not start fails, even if no test read with it
    finally:
        reader.stop()
        print(f"\nSpark reader (Spark {reader.spark_version}): started in {reader.started_in_s or 0:.1f} s, warmed up in "
              f"{reader.warmed_in_s or 0:.1f} s, {reader.reads} reads (the warm-up's 2 included) in {reader.reading_s:.1f} s")


@pytest.fixture(params=["tansu", pytest.param("kafka", marks=pytest.mark.kafka)])
def each_broker(request: pytest.FixtureRequest) -> EmbeddedBroker | KafkaBroker:
    """The test runs once on the session's Tansu broker and once on its real Kafka broker
    (``-m "not kafka"`` leaves Kafka out). On one Kafka broker a topic needs replication factor
    1: give the sink ``iceberg.control.topic.replication-factor=1`` (Tansu takes any value)."""
    chosen: EmbeddedBroker | KafkaBroker = request.getfixturevalue("broker" if request.param == "tansu" else "kafka")
    return chosen


@pytest.fixture
def catalog_props(tmp_path: Path) -> dict[str, str]:
    """Properties of a fresh SQLite SQL catalog for this test (``load_catalog(name, **props)``)."""
    from icesink.shared.catalogs import sqlite_catalog_properties

    return sqlite_catalog_properties(tmp_path / "catalog")


@pytest.fixture
def postgres() -> Iterator[Any]:
    """A PostgreSQL server of this test's own (a catalog shared by processes, a CDC source)."""
    from tests.support.postgres import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(autouse=True)
def _one_machine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under pytest-xdist (`./dev test` runs two workers) every test holds a shared lock on one
    file of the run, and a test marked ``alone`` (it measures the whole machine, e.g. its fork
    counter) holds it exclusively: it waits for the other worker's test to end and runs by itself.
    A test marked ``fixed_ports`` (it binds the ports the README writes) holds a second lock
    exclusively: such tests run one at a time, each beside any other test."""
    import contextlib
    import fcntl
    import os

    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    base = tmp_path_factory.getbasetemp().parent  # shared by the run's workers
    locks = [(base / "one-machine.lock", fcntl.LOCK_EX if alone else fcntl.LOCK_SH)]
    if request.node.get_closest_marker("fixed_ports") is not None:
        locks.insert(0, (base / "fixed-ports.lock", fcntl.LOCK_EX))  # first: not while holding the machine's
    with contextlib.ExitStack() as held:
        for path, mode in locks:
            lock = held.enter_context(path.open("a"))
            fcntl.flock(lock, mode)
            held.callback(fcntl.flock, lock, fcntl.LOCK_UN)
        yield
