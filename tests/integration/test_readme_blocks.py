"""The README's shell blocks, pasted as written into a fresh shell (issue 37): extracted from
README.md and run by bash in a directory that looks like a fresh checkout (``dev``,
``pyproject.toml`` and the ready ``.venv`` linked in, nothing else), each checked for what the
README says it prints. Each block starts an embedded stack and real worker replicas, a minute or
two: these run in ``./dev chaos`` (CI runs both suites). Every ``bash`` block of README.md is
in ``RUN`` (the test that pastes it) or ``NOT_RUN`` (why not), by its first line:
``test_every_readme_block_is_run_or_excused`` (in the default suite) fails on a new block in
neither, so none goes untested silently."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


def pasted(test: Callable[..., None]) -> Callable[..., None]:
    """The marks of a test that pastes a block: real processes, in the chaos suite, and one at a
    time (ports 8083 and 9400, as written)."""
    return pytest.mark.integration(pytest.mark.chaos(pytest.mark.fixed_ports(test)))


ROOT = Path(__file__).resolve().parents[2]

# First line of a README bash block -> the test that pastes it.
RUN = {
    "./dev demo ": "test_the_quickstarts_demo_line_runs_as_written",
    "cat > sink.json <<'EOF'": "test_the_worker_block_runs_as_written_and_ends_with_every_row",
    "./dev icesink connect --set listeners=http://127.0.0.1:8083 &": (
        "test_the_rest_flow_block_runs_as_written_and_ends_with_every_row"),
    "printf 'admin: change-me\\n' > users.properties": "test_the_basic_auth_block_runs_as_written",
}
# First line of a README bash block (or of its lines not pasted) -> why no test pastes it.
NOT_RUN = {
    "./dev test ": "the quickstart's second line: the default suite itself (CI runs it within ./dev check)",
    "./dev chaos ": "the quickstart's third line: the chaos suite itself (this file's pasting tests are in it)",
    "./dev check ": "the quickstart's fourth line: both suites in one pool, what CI runs (.ci/run)",
    "./dev icesink connect --set listeners=http://127.0.0.1:8083   #": (
        "the quickstart's fifth line: runs until stopped; the REST block starts it as its first line"),
    ".venv/bin/python -m tests.support.kafka_broker serve": (
        "runs until Ctrl-C; the broker the `kafka` fixture starts, checked by test_kafka_broker.py"),
}


def _blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _block(first_line: str) -> str:
    found = [b for b in _blocks() if b.startswith(first_line)]
    assert len(found) == 1, f"expected one README block starting {first_line!r}, found {len(found)}"
    return found[0]


def _fresh(tmp_path: Path) -> Path:
    """A directory that looks like a checkout with ./dev's environment made: its .venv is the
    project's own, so ./dev must find it installed for this pyproject.toml (else it would
    reinstall the project from the temporary directory into the shared .venv). Made anew for
    each test, at the same path beside the tests' own directories: the class-data archive ./dev
    builds (for the class path under it, in the cache beside it) is built once for all."""
    import hashlib
    import shutil

    stamp = ROOT / ".venv" / ".icesink-installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    if not stamp.exists() or stamp.read_text().strip() != want:
        pytest.fail("the .venv is not installed for this pyproject.toml: run ./dev icesink --help first")
    here = tmp_path.parent / "readme-checkout" / "icesink"
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
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


def test_every_readme_block_is_run_or_excused():
    """Each block's first line is in RUN or NOT_RUN, each other line of the quickstart is in
    NOT_RUN, and each test RUN names exists here and pastes that block."""
    blocks = _blocks()
    assert len(blocks) >= 5, blocks
    firsts = [b.splitlines()[0] for b in blocks]
    known = [*RUN, *NOT_RUN]
    unlisted = [f for f in firsts if not any(f.startswith(k) for k in known)]
    assert not unlisted, f"README bash blocks neither run by a test nor listed in NOT_RUN: {unlisted}"
    quick = blocks[0].splitlines()
    assert quick[0].startswith("./dev demo "), quick[0]
    for line in quick[1:]:
        assert any(line.startswith(k) for k in NOT_RUN), f"a quickstart line neither run nor excused: {line!r}"
    source = Path(__file__).read_text()
    for first, name in RUN.items():
        assert any(f.startswith(first) for f in firsts), f"RUN lists a block the README no longer has: {first!r}"
        assert callable(globals().get(name)), f"RUN names {name}, which is not a test here"
        body = source[source.index(f"def {name}("):].split("\ndef ", 1)[0]
        assert "_block(" in body or "_blocks()[0]" in body, f"{name} pastes no README block"
    for first in NOT_RUN:
        assert any(first in b for b in blocks), f"NOT_RUN lists a line the README no longer has: {first!r}"


def _first(name: str) -> str:
    return next(first for first, test in RUN.items() if test == name)


@pasted
@pytest.mark.timeout(1200)
def test_the_worker_block_runs_as_written_and_ends_with_every_row(tmp_path):
    here = _fresh(tmp_path)
    lines = _paste(_block(_first("test_the_worker_block_runs_as_written_and_ends_with_every_row")), here, 900)
    assert "10000" in lines, lines[-40:]  # every order in the table, once
    assert (here / "sink.json").exists()
    assert not [x for x in lines if "Traceback" in x], lines[-40:]


@pasted
def test_the_rest_flow_block_runs_as_written_and_ends_with_every_row(tmp_path):
    lines = _paste(_block(_first("test_the_rest_flow_block_runs_as_written_and_ends_with_every_row")), _fresh(tmp_path), 600)
    assert "201" in lines, lines[-40:]
    assert lines[-1] == "10000", lines[-40:]  # every order in the table, once
    assert not [x for x in lines if "Traceback" in x], lines[-40:]


@pasted
def test_the_basic_auth_block_runs_as_written(tmp_path):
    lines = _paste(_block(_first("test_the_basic_auth_block_runs_as_written")), _fresh(tmp_path), 300)
    assert lines[-2] == "401" and lines[-1].startswith("[]"), lines[-40:]  # curl prints [] without a newline


@pasted
def test_the_quickstarts_demo_line_runs_as_written(tmp_path):
    first = _blocks()[0].splitlines()[0]
    assert first.startswith("./dev demo "), first
    lines = _paste(first, _fresh(tmp_path), 600)
    text = "\n".join(lines)
    assert "rpc.pizzas" in text and "Traceback" not in text, lines[-40:]
