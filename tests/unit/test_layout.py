"""The layout a newcomer relies on: no module over about 800 lines; agents.convert a package
along the steps it documents; imports one way between the worker, the coordinator and the
writer; leaf modules (the protocol package, config, errors, metrics) free of I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agents", "coordinator", "spark_bridge", "icesink")
MAX_LINES = 800


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_800_lines(package: str) -> None:
    long = {str(p.relative_to(ROOT)): n for p in modules(package) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"expected modules of at most {MAX_LINES} lines, found {long}"


def test_convert_is_a_package_with_its_public_names() -> None:
    import agents.convert as convert

    assert (ROOT / "agents" / "convert" / "__init__.py").exists()
    for name in convert.__all__:
        assert hasattr(convert, name), name


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside functions."""
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def importers(package: str, of: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules of ``package`` importing any of the packages ``of``, with what they import."""
    found = {}
    for path in modules(package):
        hits = sorted(m for m in imported(path) if m.split(".")[0] in of)
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    return found


def test_imports_go_one_way_between_the_worker_the_coordinator_and_the_writer() -> None:
    assert importers("coordinator", ("agents",)) == {}, "coordinator/ must not import agents/"
    assert importers("spark_bridge", ("agents", "coordinator")) == {}, "spark_bridge/ imports neither side"
    assert importers("agents", ("coordinator",)) == {}, "agents/ must not import coordinator/ (the app hands it in)"
    assert importers("agents", ("spark_bridge",)) == {}, "agents/ must not import spark_bridge/ (the app hands the writer in)"


def test_only_the_composition_root_imports_everything() -> None:
    """icesink/app/ (the CLI, the replica that runs a worker and the coordinator, the embedded
    stack, the demo, icesink connect) wires the sides together; nothing imports it back, and
    the rest of icesink/ (the protocol, leaves and shared glue) imports no side."""
    outside_app = {}
    for package in PACKAGES:
        for path in modules(package):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("icesink/app/") or rel == "icesink/__main__.py":  # `python -m icesink`: app.cli
                continue
            hits = sorted(m for m in imported(path) if m == "icesink.app" or m.startswith("icesink.app."))
            if package == "icesink":
                hits += sorted(m for m in imported(path) if m.split(".")[0] in ("agents", "coordinator", "spark_bridge"))
            if hits:
                outside_app[rel] = hits
    assert outside_app == {}, f"only icesink/app/ imports icesink.app, and the sides together: {outside_app}"
    wired = {m.split(".")[0] for p in modules("icesink/app") for m in imported(p)}
    assert {"agents", "coordinator"} <= wired


def test_the_shared_schema_changes_import_no_side_and_no_io() -> None:
    hits = imported(ROOT / "icesink" / "schema_changes.py")
    assert not {m for m in hits if m.split(".")[0] in ("agents", "coordinator", "spark_bridge", "asyncio",
                                                        "aiokafka", "faust", "pyspark")}, hits


#: The leaf modules: what every side imports. They import no I/O package and, of icesink's own
#: code, only other leaves.
LEAVES = ("icesink/errors.py", "icesink/config.py", "icesink/config_providers.py", "icesink/metrics.py", "icesink/secrets.py",
          "icesink/partitioning.py", "icesink/schema_changes.py", "icesink/writable_types.py", "icesink/protocol")
IO = ("asyncio", "aiokafka", "faust", "mode", "pyspark", "py4j", "socket", "http", "sqlalchemy", "requests")


def leaf_modules() -> list[Path]:
    out: list[Path] = []
    for leaf in LEAVES:
        path = ROOT / leaf
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def test_leaf_modules_import_no_io_and_nothing_above_them() -> None:
    leaves = {str(p.relative_to(ROOT))[:-3].replace("/", ".").removesuffix(".__init__") for p in leaf_modules()}
    found = {}
    for path in leaf_modules():
        bad = sorted(m for m in imported(path)
                     if m.split(".")[0] in IO
                     or (m.split(".")[0] in PACKAGES and m not in leaves))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert found == {}, f"leaf modules importing I/O or modules above them: {found}"


def test_the_protocol_is_one_package_both_sides_import() -> None:
    """Events, their codec, the snapshot-summary keys and FileInfo live in icesink/protocol/;
    the worker and the coordinator both speak it."""
    import icesink.protocol as protocol

    for name in ("encode", "decode", "FileInfo", "DataWritten", "COMMIT_ID", "SinkState"):
        assert hasattr(protocol, name), name
    assert not (ROOT / "icesink" / "events.py").exists()
    for side in ("agents", "coordinator"):
        assert any(m.startswith("icesink.protocol") for p in modules(side) for m in imported(p)), side
