"""``icesink[glue]`` and ``icesink[hive]``: the extras pull what pyiceberg's Glue and Hive
catalogs import, and a sink configured with ``iceberg.catalog.type=glue`` or ``hive`` builds
that catalog (constructing one opens no connection)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from icesink.shared.config import load_settings
from icesink.shared.iceberg import load_catalog

ROOT = Path(__file__).resolve().parents[2]


def test_the_extras_are_declared_as_pyicebergs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["glue"] == ["pyiceberg[glue]==0.12.0"]
    assert extras["hive"] == ["pyiceberg[hive]==0.12.0"]


def sink(tmp_path, **catalog: str):
    return load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t", "state.dir": str(tmp_path),
                                      **{f"iceberg.catalog.{k}": v for k, v in catalog.items()}})


def test_a_glue_catalog_is_built_from_the_sink_settings(tmp_path):
    from pyiceberg.catalog.glue import GlueCatalog

    catalog = load_catalog(sink(tmp_path, type="glue", **{"glue.region": "eu-west-1", "glue.access-key-id": "k",
                                                            "glue.secret-access-key": "s"}))
    assert isinstance(catalog, GlueCatalog)
    assert catalog.glue.meta.region_name == "eu-west-1"


def test_a_hive_catalog_is_built_from_the_sink_settings(tmp_path):
    from pyiceberg.catalog.hive import HiveCatalog

    catalog = load_catalog(sink(tmp_path, type="hive", uri="thrift://127.0.0.1:9083"))
    assert isinstance(catalog, HiveCatalog)
