"""The layout a newcomer relies on: no module over about 800 lines; agents.convert a package
along the steps it documents."""

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


#: The worker hosts the coordinator on the leading replica; this goes when a composition root
#: runs both (issue 15).
HOSTING = {"agents/worker.py": ["coordinator.service"]}


def test_imports_go_one_way_between_the_worker_the_coordinator_and_the_writer() -> None:
    assert importers("coordinator", ("agents",)) == {}, "coordinator/ must not import agents/"
    assert importers("spark_bridge", ("agents", "coordinator")) == {}, "spark_bridge/ imports neither side"
    assert importers("agents", ("coordinator",)) == HOSTING


def test_the_shared_schema_changes_import_no_side_and_no_io() -> None:
    hits = imported(ROOT / "icesink" / "schema_changes.py")
    assert not {m for m in hits if m.split(".")[0] in ("agents", "coordinator", "spark_bridge", "asyncio",
                                                        "aiokafka", "faust", "pyspark")}, hits
