"""The README's shell blocks, pasted as written into a fresh shell (issue 37): extracted from
README.md and run by bash in a directory that looks like a fresh checkout (``dev``,
``pyproject.toml`` and the ready ``.venv`` linked in, nothing else), each checked for what the
README says it prints. The REST flow starts ``icesink connect`` with two task replicas, about
two minutes: these run in ``./dev chaos`` (CI runs both suites). Not run here: the
quickstart's `./dev test` and `./dev chaos` (CI runs `./dev test` and `./dev chaos`
themselves; the demo's line runs here) and the worker block, which needs the user's sink.json."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.alone]  # port 8083, as written

ROOT = Path(__file__).resolve().parents[2]


def _blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _block(first_line: str) -> str:
    found = [b for b in _blocks() if b.startswith(first_line)]
    assert len(found) == 1, f"expected one README block starting {first_line!r}, found {len(found)}"
    return found[0]


def _fresh(tmp_path: Path) -> Path:
    """A directory that looks like a checkout with ./dev's environment made: its .venv is the
    project's own, so ./dev must find it installed for this pyproject.toml (else it would
    reinstall the project from the temporary directory into the shared .venv)."""
    import hashlib

    stamp = ROOT / ".venv" / ".icesink-installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    if not stamp.exists() or stamp.read_text().strip() != want:
        pytest.fail("the .venv is not installed for this pyproject.toml: run ./dev icesink --help first")
    here = tmp_path / "icesink"
    here.mkdir()
    for name in ("dev", "pyproject.toml", ".venv", "agents", "coordinator", "spark_bridge", "icesink", "tests"):
        (here / name).symlink_to(ROOT / name)
    return here


def _paste(block: str, cwd: Path, timeout_s: float) -> list[str]:
    # The Spark class-data archive ./dev builds is for this directory's class path: in the test's cache.
    env = {**os.environ, "XDG_CACHE_HOME": str(cwd.parent / "cache")}
    proc = subprocess.Popen(["bash", "-c", block], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the block did not finish in {timeout_s} s:\n{out[-3000:]}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the block left running
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-3000:]
    return [line for line in out.splitlines() if not re.match(r"\d{4}-\d\d-\d\d |\[dev\] ", line)]


def test_the_rest_flow_block_runs_as_written_and_ends_with_every_row(tmp_path):
    lines = _paste(_block("./dev icesink connect --set listeners=http://127.0.0.1:8083 &"), _fresh(tmp_path), 600)
    assert "201" in lines, lines[-40:]
    assert lines[-1] == "10000", lines[-40:]  # every order in the table, once
    assert not [x for x in lines if "Traceback" in x], lines[-40:]


def test_the_basic_auth_block_runs_as_written(tmp_path):
    lines = _paste(_block("printf 'admin: change-me\\n' > users.properties"), _fresh(tmp_path), 300)
    assert lines[-2] == "401" and lines[-1].startswith("[]"), lines[-40:]  # curl prints [] without a newline


def test_the_quickstarts_demo_line_runs_as_written(tmp_path):
    first = _blocks()[0].splitlines()[0]
    assert first.startswith("./dev demo "), first
    lines = _paste(first, _fresh(tmp_path), 600)
    text = "\n".join(lines)
    assert "rpc.pizzas" in text and "Traceback" not in text, lines[-40:]
