"""Every benchmark under bench/ still imports (convert_bench.py did not, after agents/convert
became a package, and nothing noticed), and the quick ones run."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_imports(name):
    importlib.import_module(f"bench.{name}")


@pytest.mark.parametrize("script, args", [
    ("fetch_bench.py", ["--records", "400", "--repeat", "1"]),
    ("convert_bench.py", ["--records", "2000", "--repeat", "1"]),
    ("avro_bench.py", ["--records", "2000", "--repeat", "1"]),
    ("formats_bench.py", ["--records", "2000", "--repeat", "1"]),
    ("transforms_bench.py", ["--records", "2000", "--batch", "500", "--repeat", "1"]),
])
def test_a_quick_benchmark_prints_its_figures(script, args):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "records/s" in done.stdout or "ns/record" in done.stdout or "us/record" in done.stdout
