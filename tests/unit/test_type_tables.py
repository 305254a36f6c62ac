"""docs/schema-registry.md "Types at a glance" is true (issue 36 leftovers, point 5): each case
``[x]`` a cell names is a case of that format's parametrized mapping test whose Iceberg type is
the row's, and each ``test_...`` a cell names is a test of that format's file."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit import test_avro, test_json_schema, test_protobuf

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema-registry.md"
#: The table's format columns: (test module, its parametrized mapping test).
FORMATS: dict[str, tuple[ModuleType, str]] = {
    "Avro": (test_avro, "test_avro_types_map_to_iceberg_as_the_reference_sink"),
    "Protobuf": (test_protobuf, "test_scalars_and_wrappers_map_as_protobufdata"),
    "JSON Schema": (test_json_schema, "test_json_schema_types_map_as_jsonschemadata"),
}


def glance_rows() -> list[dict[str, str]]:
    text = DOC.read_text()
    section = text[text.index("## Types at a glance"):]
    section = section[:section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")), strict=True)) for line in lines[2:]]


def cases(module: ModuleType, test: str) -> dict[str, str]:
    """The mapping test's cases: the first value of each parameter set -> its Iceberg type's name."""
    mark = next(m for m in getattr(module, test).pytestmark if m.name == "parametrize")
    out: dict[str, str] = {}
    for values in mark.args[1]:
        iceberg: Any = next(v for v in values if hasattr(v, "is_primitive"))
        out[values[0]] = str(iceberg).split("(")[0]
    return out


def test_the_table_has_every_iceberg_type_and_format() -> None:
    rows = glance_rows()
    assert list(rows[0]) == ["Iceberg type", *FORMATS]
    assert len(rows) >= 16


@pytest.mark.parametrize("row", glance_rows(), ids=lambda r: r["Iceberg type"])
def test_each_cell_names_cases_and_tests_that_prove_the_row(row: dict[str, str]) -> None:
    iceberg = row["Iceberg type"].split("(")[0]
    named = 0
    for fmt, (module, test) in FORMATS.items():
        known = cases(module, test)
        for token in re.findall(r"`([^`]+)`", row[fmt]):
            if m := re.fullmatch(r"\[(\w+)\]", token):
                assert m[1] in known, f"{fmt}: [{m[1]}] is no case of {test}"
                assert known[m[1]] == iceberg, f"{fmt}: [{m[1]}] maps to {known[m[1]]}, not {iceberg}"
                named += 1
            elif token.startswith("test_"):
                assert callable(getattr(module, token, None)), f"{fmt}: {token} is no test of {module.__name__}"
                named += 1
        assert row[fmt].startswith("-") or re.search(r"`(\[\w+\]|test_\w+)`", row[fmt]), \
            f"{fmt} row {iceberg}: a source type without a test"
    assert named
