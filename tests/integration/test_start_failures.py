"""Failures a user causes at start, with the real ``icesink worker`` process: a broker that is
down, a catalog that cannot be reached or may not be written (run as another user), and a table
or namespace that does not exist (auto-create off, on the group's first start with records for
it) end the process with a non-zero exit code and one line naming what and where, not
"unexpected error" and a traceback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _worker(cfg: Path, tmp_path: Path) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-m", "icesink", "worker", "--config", str(cfg), "--metrics-port", "0"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    return done.returncode, done.stderr.strip().splitlines()


def _one_error_line(lines: list[str]) -> str:
    """icesink's one ERROR line, the last line it logs (a client library may log its own before it;
    the Spark JVM begun beside the start-up prints its own lines while the process ends)."""
    assert not any("Traceback" in line for line in lines), "\n".join(lines[-30:])
    ours = [line for line in lines if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", line)]
    errors = [line for line in ours if " ERROR   icesink" in line]
    assert len(errors) == 1 and ours[-1] == errors[0], "\n".join(lines[-30:])
    return errors[0]


def test_a_broker_that_is_down_is_one_line_naming_bootstrap_servers(catalog_props, tmp_path):
    from icesink.app.replicas import free_port
    from tests.support.sinkrun import write_config

    port = free_port()  # nothing listens there
    cfg = write_config(tmp_path / "sink.json", topics="t", tables="db.t", bootstrap=f"127.0.0.1:{port}",
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="down-sink")
    code, lines = _worker(cfg, tmp_path)
    line = _one_error_line(lines)
    assert code != 0
    assert "bootstrap.servers" in line and f"127.0.0.1:{port}" in line, line


def test_a_catalog_that_cannot_be_reached_is_one_line_naming_it(broker, tmp_path):
    from icesink.app.replicas import free_port
    from tests.support.sinkrun import write_config

    port = free_port()
    props = {"type": "rest", "uri": f"http://127.0.0.1:{port}/catalog"}
    cfg = write_config(tmp_path / "sink.json", topics="t", tables="db.t", bootstrap=broker.bootstrap,
                       catalog_props=props, state_dir=tmp_path / "state", group="nocat-sink")
    code, lines = _worker(cfg, tmp_path)
    line = _one_error_line(lines)
    assert code != 0
    assert "catalog" in line and f"127.0.0.1:{port}" in line, line
    # the Spark JVM begun beside the start-up logs through icesink's log4j config (spark_bridge/log4j2.properties)
    assert not [x for x in lines if "default log4j profile" in x or "setLogLevel" in x], "\n".join(lines[-20:])


@pytest.mark.parametrize("namespace", [True, False], ids=["table", "namespace"])
def test_a_missing_table_or_namespace_without_auto_create_is_one_line_naming_it(broker, catalog_props, tmp_path,
                                                                                   namespace):
    """A group's first start with records for a table that does not exist (auto-create off):
    exit code 2 and one ERROR line naming the key, the table and, when it is missing too, the
    namespace, with what to do."""
    import asyncio

    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import write_config

    ns = f"miss{'t' if namespace else 'n'}"
    if namespace:
        load_catalog("it", **catalog_props).create_namespace(ns)
    topic = f"{ns}-orders"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    asyncio.run(produce(broker.bootstrap, topic, list(pizza_values(10, seed=3)), partitions=1))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=f"{ns}.t", bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=f"{ns}-sink",
                       **{"iceberg.tables.auto-create-enabled": "false"})
    code, lines = _worker(cfg, tmp_path)
    assert code == 2, "\n".join(lines[-30:])
    assert not any("Traceback" in line for line in lines), "\n".join(lines[-30:])
    errors = [line for line in lines if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ERROR ", line)]
    assert len(errors) == 1, "\n".join(lines[-30:])
    line = errors[0]
    assert "iceberg.tables.auto-create-enabled" in line and f"table {ns}.t" in line, line
    assert (f"namespace {ns}" in line) is (not namespace), line


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None,
                    reason="as root, the worker runs without CAP_DAC_OVERRIDE through setpriv: root may write anything")
def test_a_catalog_the_worker_may_not_write_is_one_line_naming_the_path_and_the_key(broker, tmp_path):
    """A SQL catalog whose database (and its directory) this user may not write: the worker ends
    with one line naming the file, the catalog and its key, and what to do. As root it runs with
    no capabilities (setpriv), so that the files' modes hold for it as for any user; the same
    user, so it reads the checkout and its virtual environment wherever CI cloned them."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.catalogs import sqlite_catalog_properties
    from tests.support.sinkrun import write_config

    base = tmp_path
    props = sqlite_catalog_properties(base / "catalog")
    load_catalog("it", **props).create_namespace("db")
    for f in (base / "catalog").iterdir():
        f.chmod(0o444)
    (base / "catalog").chmod(0o555)
    state = base / "state"
    cfg = write_config(base / "sink.json", topics="perm-t", tables="db.t", bootstrap=broker.bootstrap,
                       catalog_props=props, state_dir=state, group="perm-sink")
    command = [sys.executable, "-m", "icesink", "worker", "--config", str(cfg), "--metrics-port", "0"]
    if os.geteuid() == 0:
        command = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=base)
        lines = done.stderr.strip().splitlines()
        line = _one_error_line(lines)
        assert done.returncode != 0
        assert f"no permission to use {base / 'catalog'}" in line, line
        assert "iceberg.catalog.uri=" in line and "'it'" in line and "let this user write it" in line, line
    finally:
        (base / "catalog").chmod(0o755)  # for pytest's clean-up


_LATE_JVM_LINE = """
import sys
from icesink.app import cli
from spark_bridge.session import SparkSessionOwner, SparkSettings

cli._setup_logging("INFO", "text")
owner = SparkSessionOwner(SparkSettings(master="local[1]", warm_up_rows=0, class_archive=False))
owner.start()
jvm = owner.spark.sparkContext._jvm
cli._last_line(RuntimeError("the one line"))
# What a warm-up write cut short by the exit logs from the JVM after it (TaskContextImpl's
# "Error in TaskCompletionListener"): the same logger, after the line.
jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.TaskContextImpl").error("late JVM line")
sys.exit(1)
"""


def _assert_nothing_after_the_one_line(script: str, tmp_path) -> None:
    """Run ``script`` (it logs icesink's one ERROR line, then has the JVM log "late JVM line"):
    it exits 1 with that one line, and no JVM line follows it."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, "\n".join(lines[-30:])
    assert "the one line" in _one_error_line(lines)
    assert not [x for x in lines if "late JVM line" in x], "\n".join(lines[-10:])


def test_the_spark_jvm_logs_nothing_after_the_one_line(tmp_path):
    """A start that fails while the local Spark JVM runs (its warm-up write under way): the JVM
    logs nothing after icesink's one ERROR line (seen once: 'spark.TaskContextImpl: Error in
    TaskCompletionListener' from the warm-up cut short by the exit, the line's test failed)."""
    _assert_nothing_after_the_one_line(_LATE_JVM_LINE, tmp_path)


_STARTING_JVM_LINE = """
import sys

from pyspark import SparkContext

from icesink.app import cli
from spark_bridge import session  # noqa: F401 - the worker has it: it starts the session

cli._setup_logging("INFO", "text")
SparkContext._ensure_initialized()  # the JVM is up, its SparkContext not yet made: a session being started
jvm = SparkContext._jvm
cli._last_line(RuntimeError("the one line"))
# What a SparkContext under construction as the process ends logs (seen in CI after a catalog's
# refusal): "Error initializing SparkContext", the same logger, after the line.
try:
    jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.SparkContext").error("late JVM line")
except Exception:
    pass  # a JVM that is gone logs nothing
sys.exit(1)
"""


def test_a_spark_jvm_still_starting_logs_nothing_after_the_one_line(tmp_path):
    """A start that fails while the Spark session is being made (the JVM asked for before the
    worker's imports, its SparkContext still under construction): the JVM logs nothing after
    icesink's one ERROR line (seen in CI: 'spark.SparkContext: Error initializing SparkContext'
    after a catalog's refusal, the line's test failed)."""
    _assert_nothing_after_the_one_line(_STARTING_JVM_LINE, tmp_path)
