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
