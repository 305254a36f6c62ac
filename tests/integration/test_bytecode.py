"""The set-up (``./dev``) compiles the checkout's modules: icesink is installed editable, so pip
compiles none of them, and with PYTHONDONTWRITEBYTECODE set every replica compiled all of them
again at its start (0.2 s of each start-up). A worker's imports now compile nothing of icesink."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]

COUNT_COMPILED = textwrap.dedent("""
    import importlib._bootstrap_external as external
    compiled = []
    to_code = external.SourceLoader.source_to_code
    def counting(self, data, path, *args, **kwargs):
        compiled.append(path)
        return to_code(self, data, path, *args, **kwargs)
    external.SourceLoader.source_to_code = counting
    import icesink.app.cli, agents.worker, coordinator.service, spark_bridge.writer  # a worker's imports
    root = {root!r}
    print("\\n".join(p for p in compiled if p.startswith(root) and "/tests/" not in p))
""")


def test_a_worker_process_compiles_none_of_icesinks_modules_at_start():
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # as on these machines: nothing is written
    out = subprocess.run([sys.executable, "-c", COUNT_COMPILED.format(root=str(ROOT))], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=100, check=True).stdout.split()
    assert out == [], f"compiled at start (./dev compiles them: python -m compileall): {out[:5]}"
