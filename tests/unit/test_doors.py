"""The two doors to library internals (issue 41): agents/kafka/ (Faust, mode, aiokafka) and
coordinator/iceberg_ext/ (pyiceberg) check the pinned versions at start-up, and nothing is
patched by an import: the composition root installs the pyiceberg extensions, and a commit
in a process that did not install them is refused. tests/unit/test_layout.py keeps every
private name of those libraries behind the doors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from icesink.shared.errors import ConfigError
from icesink.shared.pins import check_pinned_versions, pinned_versions

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_pins_are_read_from_the_projects_requirements() -> None:
    pins = pinned_versions(["faust-streaming", "aiokafka", "pyiceberg"])
    assert pins == {"faust-streaming": "0.15.3", "aiokafka": "0.14.0", "pyiceberg": "0.12.0"}
    # a pin of the package itself counts before one of an extra
    assert pinned_versions(["pyiceberg"], ['pyiceberg[glue]==0.11.0; extra == "glue"', "pyiceberg[sql]==0.12.0"]) \
        == {"pyiceberg": "0.12.0"}


def test_another_installed_version_is_refused_naming_the_library_and_both_versions() -> None:
    with pytest.raises(ConfigError, match=r"faust-streaming.*0\.15\.3.*agents/kafka/.*0\.16\.0") as raised:
        check_pinned_versions(["faust-streaming", "aiokafka"], "agents/kafka/",
                              installed={"faust-streaming": "0.16.0", "aiokafka": "0.14.0"},
                              pins={"faust-streaming": "0.15.3", "aiokafka": "0.14.0"})
    assert raised.value.value == "0.16.0"
    check_pinned_versions(["aiokafka"], "agents/kafka/", installed={"aiokafka": "0.14.0"}, pins={"aiokafka": "0.14.0"})


def test_the_doors_accept_the_installed_libraries() -> None:
    from agents import kafka
    from coordinator import iceberg_ext

    kafka.check_versions()
    iceberg_ext.check_versions()


def test_a_worker_refuses_to_start_faust_on_another_aiokafka(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """The worker checks the pins as it starts Faust, before any patch (agents/faust_app.py)."""
    import asyncio

    from agents.buffer import Buffers
    from agents.faust_app import FaustApp
    from agents.parts import Replica
    from icesink.shared import pins
    from icesink.shared.config import build
    from icesink.shared.metrics import Metrics

    class Hooks:  # the rest of the replica: never reached
        async def on_fetch(self, fetched: object) -> None: ...
        def fail(self, exc: Exception, exit_code: int = 2) -> None: ...
        def hold_paused_partitions(self) -> None:
            raise AssertionError("patched before the versions were checked")

    real = pins._installed
    monkeypatch.setattr(pins, "_installed", lambda name: "0.13.0" if name == "aiokafka" else real(name))
    settings = build({"topics": "t", "iceberg.tables": "db.t", "state.dir": str(tmp_path)})
    part = FaustApp(settings, "127.0.0.1:1", Replica("w1", {}), Buffers(1 << 20), Metrics(), hooks=Hooks())
    with pytest.raises(ConfigError, match=r"aiokafka.*expected aiokafka==0\.14\.0.*found '0\.13\.0'"):
        asyncio.run(part.start())


def test_importing_the_coordinator_patches_nothing_and_install_does() -> None:
    out = _run("""
        import pyiceberg.manifest as manifest
        import pyiceberg.table.update.snapshot as snapshot
        from pyiceberg.catalog.sql import SqlCatalog

        import coordinator.committer, coordinator.maintenance, coordinator.service, coordinator.commit_processes
        import agents.worker, icesink.app.cli
        from coordinator import iceberg_ext
        from icesink.shared.catalogs import sql_catalog_class

        assert snapshot.write_manifest_list is manifest.write_manifest_list, "patched on import"
        assert sql_catalog_class() is SqlCatalog
        assert not iceberg_ext.installed()
        iceberg_ext.install()
        assert snapshot.write_manifest_list is iceberg_ext.manifest_writers.write_manifest_list
        assert sql_catalog_class() is iceberg_ext.SqlCatalog
        assert iceberg_ext.installed()
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_commit_in_a_process_that_did_not_install_the_extensions_is_refused() -> None:
    out = _run("""
        from coordinator import iceberg_ext
        from coordinator.committer import RoundCommit, commit_table

        try:
            commit_table(None, "db.t", [], RoundCommit(group="g", epoch=1, commit_id="c", positions={}, valid_through_ms=None))
        except iceberg_ext.NotInstalled as exc:
            print("refused:", exc)
    """)
    assert out.startswith("refused: coordinator.iceberg_ext.install() was not called"), out


def test_every_entry_point_that_commits_installs_the_extensions() -> None:
    """A replica (``icesink worker``; the demo, the embedded stack and ``icesink connect`` run
    replicas as such processes) and a commit process install before they commit; both are run
    for real by the integration tests, whose commits fail if one did not."""
    import inspect

    from coordinator import commit_processes
    from icesink.app import cli

    assert "iceberg_ext.install()" in inspect.getsource(cli.cmd_worker)
    assert "iceberg_ext.install()" in inspect.getsource(commit_processes._start)


SCHEMAS = [
    pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())]),
    pa.schema([
        pa.field("s", pa.struct([pa.field("a", pa.int32(), nullable=False), pa.field("b", pa.list_(pa.float64()))])),
        pa.field("m", pa.map_(pa.string(), pa.struct([pa.field("x", pa.bool_())]))),
        pa.field("l", pa.large_list(pa.field("item", pa.struct([pa.field("y", pa.binary())]), nullable=False))),
        pa.field("f", pa.list_(pa.int16(), 3)),
    ]),
    pa.schema([
        pa.field("ts", pa.timestamp("us", tz="UTC")), pa.field("t", pa.timestamp("us")),
        pa.field("d", pa.date32()), pa.field("dec", pa.decimal128(12, 3)), pa.field("u", pa.large_string()),
        pa.field("dict", pa.dictionary(pa.int32(), pa.string())), pa.field("fix", pa.binary(16)),
        pa.field("doc", pa.int64(), metadata={b"doc": b"a column with a doc"}),
    ]),
    pa.schema([pa.field("ids", pa.list_(pa.field("element", pa.int64(), nullable=False)), nullable=False),
               pa.field("nested", pa.map_(pa.string(), pa.list_(pa.map_(pa.int32(), pa.string()))))]),
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_the_schema_conversion_by_public_api_is_pyicebergs_own(schema: pa.Schema) -> None:
    """icesink.shared.schema_changes.iceberg_schema (what agents/tables.py creates tables with) gives
    what pyiceberg 0.12's private ``Catalog._convert_schema_if_needed`` gave, numbered afresh."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    from icesink.shared.schema_changes import iceberg_schema

    theirs = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
    assert iceberg_schema(schema) == theirs
    assert iceberg_schema(schema).model_dump_json() == theirs.model_dump_json()
