"""Shared fixtures. Heavy modules are imported inside fixtures so unit tests stay fast."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from icesink.app.embedded import EmbeddedBroker


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


@pytest.fixture
def catalog_props(tmp_path: Path) -> dict[str, str]:
    """Properties of a fresh SQLite SQL catalog for this test (``load_catalog(name, **props)``)."""
    from icesink.catalogs import sqlite_catalog_properties

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
