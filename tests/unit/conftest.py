"""Hypothesis profiles: ``dev`` (default, keeps the unit suite fast) and ``ci`` (many more
examples): ``pytest --hypothesis-profile=ci tests/unit``. Tests that pin ``max_examples`` in
their own ``@settings`` keep it. The ``two_tables`` fixture: a SQLite catalog with tables
``db.a`` and ``db.b`` of one long column ``id`` (field id 1), for the coordinator's commits."""

import logging

import pytest
from hypothesis import HealthCheck, settings
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", max_examples=400, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("dev")


@pytest.fixture(autouse=True)
def _logging_on_again():
    """A command's failed start silences logging for the rest of its process
    (icesink.app.log_format.last_line); tests that run ``main()`` in this one must not leave it
    so for the next test (the redaction and shutdown tests then saw no records), nor the root
    logger's handler their ``main()`` set up."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    logging.disable(logging.NOTSET)
    root.handlers, root.level = handlers, level


@pytest.fixture
def two_tables(tmp_path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    for name in ("db.a", "db.b"):
        catalog.create_table(name, schema=Schema(NestedField(1, "id", LongType(), required=False)))
    return catalog
